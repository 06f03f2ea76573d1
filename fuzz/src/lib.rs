//! Shared pieces of gyre's fuzz targets.
//!
//! The service's text modules that the targets fuzz (the incremental
//! detokenizer, the tool-call and reasoning parsers) are compiled here from
//! their own source files: the `gyre-service` crate links libtorch through
//! the engine, which a fuzz build must not need. Those modules depend on
//! nothing else of the service but `compact` and `holdback`, included the
//! same way.

#[path = "../../service/src/compact.rs"]
pub mod compact;
#[path = "../../service/src/detok.rs"]
pub mod detok;
#[path = "../../service/src/holdback.rs"]
pub mod holdback;
#[path = "../../service/src/reasoning.rs"]
pub mod reasoning;
#[path = "../../service/src/tools/mod.rs"]
pub mod tools;

pub mod input;
