//! birdjepa core: Arrow shards of encoded audio -> deterministic, resumable batches of log-mel features.
//!
//! No Python in here: the PyO3 layer lives in `rust/py` and only converts types.
pub mod audio;
pub mod audio_source;
pub mod dataset;
pub mod debug_hooks;
pub mod error;
pub mod rng;
pub mod shard;
pub mod loader;
pub mod options;
pub mod plan;
