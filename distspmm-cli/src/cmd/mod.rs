//! One module per subcommand; each has an `Args` (clap) and a `run`.

pub mod bench;
pub mod dist_bench;
pub mod doctor;
pub mod generate;
pub mod inspect;
pub mod output;
pub mod partition;
pub mod plan;
pub mod ranks;
pub mod train;
pub mod verify;

/// An error and its causes on one line, as the command line prints them: each cause after a
/// colon, except a cause whose text the message already holds (an error that embeds its
/// source's text would otherwise print it twice, "Permission denied (os error 13): Permission
/// denied (os error 13)").
pub fn message(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let inner = distspmm_core::chunk::ChunkDirError::Io {
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
