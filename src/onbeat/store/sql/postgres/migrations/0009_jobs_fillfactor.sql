-- A cron job's row is updated at each of its fires (next_fire_at, updated_at: no index holds
-- either), so its pages keep room for that update: it can then be HOT, a new version in the same
-- page and no new entry in any of the job's five indexes. At fillfactor 100 every fire wrote
-- five index entries and moved the row to a new page. Pages written before this keep their fill
-- until rewritten (a new version of each row goes to a page with room).
ALTER TABLE jobs SET (fillfactor = 70);
