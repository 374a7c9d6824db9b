//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod bench;
pub mod dist_bench;
pub mod doctor;
pub mod generate;
pub mod inspect;
pub mod partition;
pub mod plan;
pub mod predict;
pub mod ranks;
pub mod train;
pub mod verify;

/// An error and its causes on one line, as the command line prints them and as the trainer
/// hands them to the other ranks (one rule: [`distspmm_gcn::one_line`]).
pub fn message(err: &anyhow::Error) -> String {
    distspmm_gcn::one_line(err)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let inner = chunk_format::dir::ChunkDirError::Io {
            path: "m.json".into(),
            source: io,
        };
        let err = anyhow::Error::new(inner).context("cannot open the chunk directory");
        let text = super::message(&err);
        assert_eq!(text.matches("ermission denied").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot open the chunk directory: m.json: "),
            "{text}"
        );
        let plain = anyhow::anyhow!("low").context("high");
        assert_eq!(super::message(&plain), "high: low");
    }
}
