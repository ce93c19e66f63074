//! warmpath-bench: replays workloads against simulated model servers and compares routing strategies.
//!
//! - [`workload`]: seeded generators (multi-turn chat, RAG, templated assistant, code completion, unique prompts).
//! - [`trace`]: Mooncake JSONL and Azure CSV trace loaders (bad lines counted and reported with line numbers).
//! - [`client`]: one streaming request, measured (TTFT, end-to-end, server `usage`, answering endpoint).
//! - [`harness`]: one strategy end to end (fresh servers, Envoy + filter or a client-side baseline, replay).
//! - [`baselines`]: SageMaker-, GIE- and SGLang-router-style policies behind the core's `Policy` trait.
//! - [`peers`]: the real SGLang Model Gateway and vLLM router, run as their own processes.
//! - [`kvcost`]: Dynamo-style KV-block cost routing and the exact-state references `ORACLE`, `ORACLE_TTFT`.
//! - [`router`], [`loads`]: client-side routing state and the `/metrics` reader.
//! - [`report`], [`plot`], [`pooled`]: the table, CSV, PNG charts and the pooled-cache bound.

pub mod baselines;
pub mod client;
pub mod harness;
pub mod kvcost;
pub mod loads;
pub mod peers;
pub mod plot;
pub mod pooled;
pub mod report;
pub mod router;
pub mod trace;
pub mod workload;
