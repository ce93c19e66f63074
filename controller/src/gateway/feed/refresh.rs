//! The feed loop (not a reconciler: a timer over the feeds the routing reconcilers registered).
//! Keeps every registered feed fresh: on each feed's interval, list the backend's ready endpoints
//! and scrape their metrics, then update the snapshot (its version grows only on change).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{discovery, scrape};
use crate::metrics::ScrapeLabels;
use crate::reconcile::Context;

/// Refreshes one feed now. Errors (backend gone, API failure) leave the last snapshot in place.
pub async fn refresh(ctx: &Context, http: &reqwest::Client, key: &str) -> Result<u64, String> {
    let source = ctx.feed_sources.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned();
    let Some(source) = source else { return Err(format!("no feed {key}")) };
    let targets = discovery::targets(&ctx.client, &source.backend, &source.load).await?;
    let res = scrape::scrape_all(http, &targets, &source.load.metrics_path).await;
    ctx.metrics.scrapes.get_or_create(&ScrapeLabels { result: "ok".into() }).inc_by(res.ok);
    ctx.metrics.scrapes.get_or_create(&ScrapeLabels { result: "error".into() }).inc_by(res.failed);
    Ok(ctx.feeds.update(key, res.endpoints))
}

/// Runs forever: every second, refreshes the feeds whose interval has elapsed.
pub async fn run(ctx: Context) {
    let http = reqwest::Client::new();
    let mut due: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let sources: Vec<(String, u64)> = ctx
            .feed_sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, s)| (k.clone(), s.load.interval_seconds.clamp(1, 300) as u64))
            .collect();
        due.retain(|k, _| sources.iter().any(|(s, _)| s == k));
        let now = Instant::now();
        for (key, every) in sources {
            if due.get(&key).is_some_and(|t| *t > now) {
                continue;
            }
            due.insert(key.clone(), now + Duration::from_secs(every));
            if let Err(e) = refresh(&ctx, &http, &key).await {
                tracing::warn!(feed = %key, error = %e, "feed refresh failed; keeping the last snapshot");
            }
        }
    }
}
