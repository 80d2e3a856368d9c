//! Options read from the environment, for the backends' documented
//! `from_env` entry points (library code reads the environment nowhere else).

use crate::{Error, Result};

/// The value environment variable `var` names among `choices` (name, value);
/// unset, empty or not UTF-8 gives `default`; any other text is an
/// [`Error::Unsupported`] of `backend` that quotes it and lists the names.
pub fn choice<T: Copy>(backend: &'static str, var: &str, default: T, choices: &[(&str, T)]) -> Result<T> {
    let text = match std::env::var(var) {
        Ok(text) if !text.is_empty() => text,
        _ => return Ok(default),
    };
    if let Some(&(_, value)) = choices.iter().find(|(name, _)| *name == text) {
        return Ok(value);
    }
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let expected = match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "nothing".into(),
    };
    Err(Error::Unsupported { backend, what: format!("{var}={text:?} (expected {expected})") })
}

/// The positive, finite number environment variable `var` holds; unset,
/// empty or not UTF-8 gives `None`; any other text is an
/// [`Error::Unsupported`] of `backend` that quotes it.
pub fn positive_number(backend: &'static str, var: &str) -> Result<Option<f64>> {
    match std::env::var(var) {
        Ok(text) if !text.is_empty() => parse_positive(&text).map(Some).ok_or_else(|| Error::Unsupported {
            backend,
            what: format!("{var}={text:?} (expected a positive number)"),
        }),
        _ => Ok(None),
    }
}

fn parse_positive(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_named_value_defaults_when_unset_and_quotes_what_it_rejects() {
        let var = "DECODE_ATTN_TEST_ENV_CHOICE";
        let choices = [("auto", 0), ("one", 1), ("two", 2)];
        std::env::remove_var(var);
        assert_eq!(choice("test", var, 7, &choices).unwrap(), 7);
        std::env::set_var(var, "");
        assert_eq!(choice("test", var, 7, &choices).unwrap(), 7);
        std::env::set_var(var, "two");
        assert_eq!(choice("test", var, 7, &choices).unwrap(), 2);
        std::env::set_var(var, "three");
        let err = choice("test", var, 7, &choices).unwrap_err().to_string();
        assert!(err.contains(r#"DECODE_ATTN_TEST_ENV_CHOICE="three" (expected auto, one or two)"#), "{err}");
        std::env::remove_var(var);
    }

    #[test]
    fn positive_numbers_parse_and_anything_else_is_quoted() {
        let var = "DECODE_ATTN_TEST_ENV_NUMBER";
        std::env::remove_var(var);
        assert_eq!(positive_number("test", var).unwrap(), None);
        std::env::set_var(var, "4320");
        assert_eq!(positive_number("test", var).unwrap(), Some(4320.0));
        std::env::set_var(var, " 2.5e3 ");
        assert_eq!(positive_number("test", var).unwrap(), Some(2500.0));
        for bad in ["0", "-1", "inf", "NaN", "fast"] {
            std::env::set_var(var, bad);
            let err = positive_number("test", var).unwrap_err().to_string();
            assert!(
                err.contains(&format!("DECODE_ATTN_TEST_ENV_NUMBER={bad:?} (expected a positive number)")),
                "{err}"
            );
        }
        std::env::remove_var(var);
    }
}
