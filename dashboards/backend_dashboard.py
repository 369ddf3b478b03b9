"""What every backend's dashboard has around its own rows: instance and store variables drawn
from one of the backend's series, the firing alerts of the store as annotations, and Prometheus as
the default data source."""

from __future__ import annotations

from collections.abc import Sequence

from guarded.observability import telemetry_names as names

from . import promql as q
from .model import AlertAnnotation, Dashboard, QueryVariable, Row
from .provisioning import PROMETHEUS_NAME, PROMETHEUS_UID

INSTANCE = "instance"


def store_variables(source: str) -> tuple[QueryVariable, QueryVariable]:
    """The instance variable, then the store variable of the chosen instance, both read from the
    label values of the series ``source``."""
    return (
        QueryVariable(INSTANCE, "Instance", source),
        QueryVariable(names.LABEL_STORE, "Store", f"{source}{{{q.variable_matcher(INSTANCE)}}}"),
    )


def backend_dashboard(
    *,
    uid: str,
    title: str,
    description: str,
    tags: tuple[str, ...],
    source: str,
    alerts: Sequence[str],
    rows: tuple[Row, ...],
    variables: tuple[QueryVariable, ...] = (),
) -> Dashboard:
    """A backend's dashboard of ``rows``: :func:`store_variables` of ``source`` followed by
    ``variables``, and ``alerts`` of the chosen store firing as annotations."""
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=tags,
        variables=(*store_variables(source), *variables),
        annotations=(
            AlertAnnotation(
                "Store alerts",
                q.firing_alerts(tuple(alerts), q.variable_matcher(names.LABEL_STORE)),
                color="orange",
            ),
        ),
        rows=rows,
        default_datasource_uid=PROMETHEUS_UID,
        default_datasource_name=PROMETHEUS_NAME,
    )


__all__ = ["INSTANCE", "backend_dashboard", "store_variables"]
