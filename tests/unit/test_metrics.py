"""Every metric follows Prometheus naming conventions and carries only bounded labels."""

from __future__ import annotations

from onbeat.metrics import Metrics

UNBOUNDED_LABELS = {"job_id", "execution_id", "id", "key", "key_id", "path", "tenant", "owner"}


def test_every_metric__is_named_by_convention_with_base_units() -> None:
    families = list(Metrics().registry.collect())
    assert len(families) == 21
    for family in families:
        assert family.name.startswith("onbeat_"), family.name
        assert family.documentation, family.name
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_runs")), family.name
        if family.type == "counter":
            assert not family.name.endswith(("_seconds", "_total")), family.name
        assert not family.name.endswith(("_milliseconds", "_ms", "_minutes")), family.name


def test_every_counter__exposes_a_total_sample() -> None:
    metrics = Metrics()
    metrics.retries.labels("t").inc()
    text = metrics.exposition().decode()
    assert 'onbeat_retries_total{task="t"} 1.0' in text
    assert "onbeat_lease_expiries_total 0.0" in text


def test_no_metric__has_a_label_that_can_carry_an_id() -> None:
    metrics = Metrics()
    for metric in vars(metrics).values():
        labels = set(getattr(metric, "_labelnames", ()))
        assert not labels & UNBOUNDED_LABELS, metric
        assert labels <= {
            "task",
            "status",
            "route",
            "method",
            "kind",
            "outcome",
            "cause",
            "priority",
        }, metric
