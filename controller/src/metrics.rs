//! Prometheus metrics of the controller (prometheus-client), served on `/metrics`.
//!
//! Reconcile metrics are labelled by controller name so every reconciler (routing, caches) shares
//! one family: `warmpath_reconcile_total{controller,result}` and
//! `warmpath_reconcile_errors_total{controller,error}`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of `warmpath_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// Reconciler name, e.g. `routing-policy`.
    pub controller: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Labels of `warmpath_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Reconciler name.
    pub controller: String,
    /// [`crate::Error::metric_label`].
    pub error: String,
}

/// Labels of the feed scrape counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScrapeLabels {
    /// `ok` or `error`.
    pub result: String,
}

/// All controller metrics plus the registry that exports them.
pub struct Metrics {
    /// Registry holding every family below.
    pub registry: Registry,
    /// Reconciles by controller and result.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Reconcile errors by controller and error kind.
    pub errors: Family<ErrorLabels, Counter>,
    /// Model-server metric scrapes by result.
    pub scrapes: Family<ScrapeLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("warmpath");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let scrapes = Family::<ScrapeLabels, Counter>::default();
        registry.register("reconcile", "Reconciles by controller and result", reconciles.clone());
        registry.register("reconcile_errors", "Reconcile errors by controller and kind", errors.clone());
        registry.register("feed_scrapes", "Model-server metric scrapes by result", scrapes.clone());
        Self { registry, reconciles, errors, scrapes }
    }
}

impl Metrics {
    /// Counts one successful reconcile of `controller`.
    pub fn reconcile_ok(&self, controller: &str) {
        self.reconciles.get_or_create(&ReconcileLabels { controller: controller.into(), result: "ok".into() }).inc();
    }

    /// Counts one failed reconcile of `controller`, by error kind.
    pub fn reconcile_error(&self, controller: &str, err: &crate::Error) {
        self.reconciles.get_or_create(&ReconcileLabels { controller: controller.into(), result: "error".into() }).inc();
        self.errors
            .get_or_create(&ErrorLabels { controller: controller.into(), error: err.metric_label().into() })
            .inc();
    }

    /// Text exposition (OpenMetrics) of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_up_in_the_exposition() {
        let m = Metrics::default();
        m.reconcile_ok("routing-policy");
        m.reconcile_error("routing-policy", &crate::Error::InvalidSpec("x".into()));
        let text = m.encode();
        assert!(text.contains(r#"warmpath_reconcile_total{controller="routing-policy",result="ok"} 1"#), "{text}");
        assert!(
            text.contains(r#"warmpath_reconcile_errors_total{controller="routing-policy",error="invalid_spec"} 1"#),
            "{text}"
        );
    }
}
