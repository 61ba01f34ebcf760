//! Small helpers for hand-written argument parsing: `--name value` and `--name=value`.

use std::fmt;
use std::str::FromStr;

/// A command-line mistake; reported with the usage text and exit status 2. An empty message
/// means the command's help was asked for (`--help` or `-h` where an option may stand).
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl UsageError {
    /// `--help` or `-h` was given.
    pub fn help() -> UsageError {
        UsageError(String::new())
    }

    pub fn is_help(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Splits `--name=value` into `("--name", Some("value"))`; other arguments come back whole.
pub fn split_flag(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with('-') => (name, Some(value)),
        _ => (arg, None),
    }
}

/// The value of option `name`: the inline `=value`, else the next argument.
pub fn take_value(
    rest: &mut impl Iterator<Item = String>,
    name: &str,
    inline: Option<&str>,
) -> Result<String, UsageError> {
    match inline {
        Some(v) => Ok(v.to_string()),
        None => rest
            .next()
            .ok_or_else(|| UsageError(format!("option {name} needs a value"))),
    }
}

/// Parses the value of option `name`, naming both in the error.
pub fn parse_value<T: FromStr>(name: &str, value: &str, what: &str) -> Result<T, UsageError> {
    value
        .parse()
        .map_err(|_| UsageError(format!("option {name}: {value:?} is not {what}")))
}

/// Shorthand for the common `take_value` + `parse_value`.
pub fn take_parsed<T: FromStr>(
    rest: &mut impl Iterator<Item = String>,
    name: &str,
    inline: Option<&str>,
    what: &str,
) -> Result<T, UsageError> {
    let value = take_value(rest, name, inline)?;
    parse_value(name, &value, what)
}

/// The error for an argument no option of `command` matches; `--help` and `-h` ask for the
/// command's help instead (every parser ends in this, so every command takes them).
pub fn unknown_option(command: &str, arg: &str) -> UsageError {
    if matches!(arg, "--help" | "-h") {
        return UsageError::help();
    }
    UsageError(format!("{command}: unknown option {arg:?}"))
}

/// Owned arguments, as the parsers take them (for the parsers' tests).
#[cfg(test)]
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_with_inline_and_separate_values() {
        assert_eq!(split_flag("--port=5"), ("--port", Some("5")));
        assert_eq!(split_flag("--port"), ("--port", None));
        assert_eq!(split_flag("a=b"), ("a=b", None));
        let mut rest = vec!["7".to_string()].into_iter();
        assert_eq!(take_parsed::<u16>(&mut rest, "-n", None, "a number"), Ok(7));
        assert!(take_value(&mut rest, "-n", None).is_err());
        let err = parse_value::<u16>("--port", "x", "a port").unwrap_err();
        assert_eq!(err.0, "option --port: \"x\" is not a port");
    }
}
