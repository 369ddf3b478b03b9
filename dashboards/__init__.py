"""Dashboards and alert rules as code.

Built from the metric-name constants in :mod:`guarded.observability.telemetry_names`, so a renamed metric can
never leave a panel or an alert silently empty. ``python -m dashboards`` writes what operators
deploy into ``grafana/``; a test fails when the committed files differ from what this package
generates.

:func:`dashboards.build.all_dashboards` returns every dashboard's JSON and
:func:`dashboards.build.panel_queries` every panel query with its template variables expanded;
docs/dashboards.md explains each panel and how to run Grafana with ``grafana/``.
"""
