//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod bench;
pub mod dist_bench;
pub mod doctor;
pub mod generate;
pub mod inspect;
pub mod partition;
pub mod plan;
pub mod ranks;
pub mod train;
pub mod verify;
