-- An attempt is written once, when it ends (a running attempt is its run's row), so its pages no
-- longer keep room for an update: the DEFAULT partition goes back to the default fill (day
-- partitions are created without it from now on; older ones keep theirs until retention drops them).
ALTER TABLE attempts_default RESET (fillfactor);
