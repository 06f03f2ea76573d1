//! Integer request fields that JSON may also spell as whole-number floats.
//!
//! JSON Schema's `integer` (which OpenAI's API schema uses for `n`,
//! `max_tokens`, `seed`, `logprobs`, ...) is any number with no fractional
//! part, so `16.0` is the integer 16, as OpenAI's own API takes it. Use as
//! `#[serde(default, deserialize_with = "int::opt")]` on an `Option<T>`
//! field; `2.5`, strings and out-of-range values stay errors (400 naming the
//! field).

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
use serde_json::Number;

/// `None` for null or absent; else the integer, whole floats included.
pub fn opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    match Option::<Number>::deserialize(d)? {
        None => Ok(None),
        Some(n) => whole::<T>(&n)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("expected an integer in range, got {n}"))),
    }
}

/// `n` as a `T` when it is a whole number in `T`'s range.
fn whole<T: TryFrom<i64> + TryFrom<u64>>(n: &Number) -> Option<T> {
    if let Some(u) = n.as_u64() {
        return T::try_from(u).ok();
    }
    if let Some(i) = n.as_i64() {
        return T::try_from(i).ok();
    }
    // 2^64 and -2^63 are exact as f64; `as` is exact for whole values
    // strictly inside them.
    const U64_END: f64 = 18_446_744_073_709_551_616.0;
    const I64_MIN: f64 = -9_223_372_036_854_775_808.0;
    let f = n.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0)?;
    if (0.0..U64_END).contains(&f) {
        T::try_from(f as u64).ok()
    } else if (I64_MIN..0.0).contains(&f) {
        T::try_from(f as i64).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::{Value, json};

    #[derive(Debug, Deserialize)]
    struct Fields {
        #[serde(default, deserialize_with = "super::opt")]
        small: Option<u32>,
        #[serde(default, deserialize_with = "super::opt")]
        signed: Option<i64>,
    }

    fn parse(v: Value) -> Result<Fields, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_floats_are_integers() {
        let f = parse(json!({"small": 62.0, "signed": -3.0})).expect("whole");
        assert_eq!((f.small, f.signed), (Some(62), Some(-3)));
        let f = parse(json!({"small": 7, "signed": -9_007_199_254_740_993_i64})).expect("ints");
        assert_eq!((f.small, f.signed), (Some(7), Some(-9_007_199_254_740_993)));
        let f = parse(json!({"small": null})).expect("null");
        assert_eq!((f.small, f.signed), (None, None));
        let f = parse(json!({"small": 1e3})).expect("exponent");
        assert_eq!(f.small, Some(1000));
    }

    #[test]
    fn fractions_strings_and_out_of_range_are_errors() {
        for bad in [
            json!({"small": 2.5}),
            json!({"small": -1}),
            json!({"small": -1.0}),
            json!({"small": 4_294_967_296_u64}),
            json!({"small": 4_294_967_296.0}),
            json!({"small": "3"}),
            json!({"signed": 1e19}),
            json!({"signed": -1e19}),
            json!({"signed": true}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
        let err = parse(json!({"small": 2.5})).expect_err("fraction");
        assert!(err.contains("2.5"), "{err}");
    }
}
