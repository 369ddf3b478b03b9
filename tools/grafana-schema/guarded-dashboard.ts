/**
 * The exact shape of guarded's generated dashboards, built from Grafana's own `@grafana/schema`
 * (the version pinned in package.json) so that TypeScript strict checks every dashboard JSON:
 * tests/dashboards/test_grafana_schema.py writes each grafana/dashboards/*.json as an object
 * literal typed `GuardedDashboard` and runs `tsc --strict --noEmit` on it.
 *
 * Object literals get TypeScript's excess-property check, so a field the schema does not know is
 * an error, as is a missing required field, a wrong type or a value outside an enum. The schema's
 * loose spots are closed here rather than left open:
 * - panels are a union on `type` with each plugin's own `Options` and custom `FieldConfig`
 *   (the schema's generic Panel takes any `options` and any `fieldConfig.defaults.custom`);
 * - query targets are `PrometheusQuery`, the DataQuery fields plus the Prometheus plugin's query
 *   fields (the schema types `targets` as any record; the Prometheus plugin's PromQuery type lives
 *   in @grafana/prometheus, which is not a schema package), listed below and nothing else;
 * - the alert annotation is `PrometheusAnnotation`, the schema's AnnotationQuery plus the
 *   Prometheus plugin's annotation fields, likewise listed.
 * String enums of the schema are matched by their values (`"absolute"` for
 * ThresholdsMode.Absolute), since JSON carries the values.
 */

import type * as common from "@grafana/schema";
import type * as raw from "@grafana/schema/dist/esm/raw/dashboard/x/Dashboard_types.gen";
import type * as stat from "@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen";
import type * as statetimeline from "@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen";
import type * as timeseries from "@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen";

/** A schema type as JSON spells it: each string enum replaced by the union of its values. */
export type Json<T> = T extends string
  ? string extends T
    ? string
    : `${T}`
  : T extends ReadonlyArray<infer Item>
    ? Array<Json<Item>>
    : T extends object
      ? { [Key in keyof T]: Json<T[Key]> }
      : T;

/** The schema's DataSourceRef, narrowed to a Prometheus data source (guarded's only kind). */
export interface PrometheusRef extends raw.DataSourceRef {
  type: "prometheus";
  uid: string;
}

/** A Prometheus query target: DataQuery plus the Prometheus plugin's query fields guarded writes. */
export interface PrometheusQuery extends Omit<common.DataQuery, "datasource"> {
  datasource: PrometheusRef;
  /** The PromQL expression. */
  expr: string;
  /** Legend template (`{{label}}`). */
  legendFormat?: string;
  /** Ask Prometheus for exemplars alongside the samples. */
  exemplar?: boolean;
  /** Evaluate at the end of the range only (stat panels). */
  instant?: boolean;
  /** Evaluate over the dashboard's range (graphs). */
  range?: boolean;
  /** Which query editor opens: the code editor or the builder. */
  editorMode?: "code" | "builder";
}

/** An annotation from a Prometheus query: the schema's AnnotationQuery and the plugin's fields. */
export interface PrometheusAnnotation extends Json<Omit<raw.AnnotationQuery, "datasource">> {
  datasource: PrometheusRef;
  /** The PromQL expression; each series it returns while non-zero is an annotation. */
  expr: string;
  step?: string;
  tagKeys?: string;
  textFormat?: string;
  titleFormat?: string;
  useValueForTime?: boolean;
}

/**
 * A template variable: the schema's VariableModel plus `definition`, the query text Grafana itself
 * writes beside `query` for a query variable (QueryVariableModel in @grafana/data; not in the
 * schema package).
 */
export interface GuardedVariable extends Json<raw.VariableModel> {
  definition?: string;
}

/** The parts of a panel common to every kind, without the schema's loosely typed ones. */
type PanelBase = Json<Omit<raw.Panel, "type" | "options" | "targets" | "fieldConfig" | "datasource">> & {
  datasource: PrometheusRef;
  gridPos: raw.GridPos;
  id: number;
  title: string;
  targets: PrometheusQuery[];
};

/** A field override: a matcher and the properties it sets. */
type Override = Json<raw.FieldConfigSource["overrides"][number]>;

/** The field configuration of a panel whose plugin's custom field config is `Custom`. */
interface FieldConfigSource<Custom> {
  defaults: Json<Omit<raw.FieldConfig, "custom">> & { custom?: Json<Custom> };
  overrides: Override[];
}

export interface TimeSeriesPanel extends PanelBase {
  type: "timeseries";
  options: Json<timeseries.Options>;
  fieldConfig: FieldConfigSource<timeseries.FieldConfig>;
}

export interface StatPanel extends PanelBase {
  type: "stat";
  options: Json<stat.Options>;
  /** The stat plugin has no custom field config. */
  fieldConfig: FieldConfigSource<Record<never, never>>;
}

export interface StateTimelinePanel extends PanelBase {
  type: "state-timeline";
  options: Json<statetimeline.Options>;
  fieldConfig: FieldConfigSource<statetimeline.FieldConfig>;
}

export type GuardedPanel = TimeSeriesPanel | StatPanel | StateTimelinePanel;

/** A row: guarded's rows are expanded, so their panels follow them in the dashboard's list. */
export interface GuardedRow extends Json<Omit<raw.RowPanel, "panels">> {
  panels: GuardedPanel[];
}

/** A whole dashboard as grafana/dashboards/*.json holds it. */
export interface GuardedDashboard
  extends Json<Omit<raw.Dashboard, "annotations" | "panels" | "templating">> {
  annotations: { list: PrometheusAnnotation[] };
  panels: Array<GuardedRow | GuardedPanel>;
  templating: { list: GuardedVariable[] };
}
