//! Request values parsed once, where they enter a service: a [`Sku`], a [`ReservationId`], a
//! [`Quantity`] or a [`TtlSeconds`] that exists has passed the rules in [`super::validate`], so
//! the layers below never check (or forget to check) again.
//!
//! Each type deserialises through `TryFrom` and serialises as the bare value, so the JSON wire
//! format is the same as that of the plain string or number; path segments deserialise the same
//! way. A refused value's error message is the detail text clients get in the `400` problem.

use std::fmt;
use std::str::FromStr;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::limits::{QUANTITY_MAX, TTL_SECONDS_DEFAULT};
use super::{validate, OrderLine};

/// Why a value was refused; its text is the problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidValue(pub String);

impl fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidValue {}

/// The start of every message the rules produce: the field they refused (or the order line).
const RULE_SUBJECTS: [&str; 7] = [
    "sku ",
    "reservation_id ",
    "adjustment_id ",
    "quantity ",
    "ttl_seconds ",
    "delta ",
    "lines[",
];

/// The rule a body or path deserialisation error reports, without the parser's position, if the
/// error is a refused value rather than malformed input. Lets the edge answer a refused value
/// with exactly the rule's words while malformed JSON keeps the parser's description.
pub fn rule_violation(message: &str) -> Option<&str> {
    let message = strip_position(message);
    RULE_SUBJECTS
        .iter()
        .any(|subject| message.starts_with(subject))
        .then_some(message)
}

/// `"... at line 1 column 42"` → `"..."` (serde_json appends the position to every error).
fn strip_position(message: &str) -> &str {
    let Some(at) = message.rfind(" at line ") else {
        return message;
    };
    let mut rest = message[at + " at line ".len()..].splitn(2, " column ");
    let numeric =
        |s: Option<&str>| s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    if numeric(rest.next()) && numeric(rest.next()) {
        &message[..at]
    } else {
        message
    }
}

macro_rules! string_value {
    ($(#[$doc:meta])* $name:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidValue;

            fn try_from(value: String) -> Result<Self, InvalidValue> {
                let check: fn(&str) -> Result<(), String> = $check;
                check(&value).map_err(InvalidValue)?;
                Ok($name(value))
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidValue;

            fn try_from(value: &str) -> Result<Self, InvalidValue> {
                $name::try_from(value.to_owned())
            }
        }

        impl FromStr for $name {
            type Err = InvalidValue;

            fn from_str(value: &str) -> Result<Self, InvalidValue> {
                $name::try_from(value.to_owned())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }
    };
}

/// A JSON number as an integer of type `T`, if it is one. JSON has a single number type and JSON
/// Schema's `integer` admits `2.0`, so an integral number written with a fraction or an exponent
/// is the same value as its plain spelling; a value outside `T` (or `±2^53` for a float spelling,
/// beyond which floats are not exact) is reported as `out_of_range`, anything fractional as not an
/// integer.
fn integral<T: TryFrom<i128>>(
    number: &serde_json::Number,
    field: &str,
) -> Result<T, IntegralError> {
    let wide: i128 = if let Some(v) = number.as_i64() {
        v.into()
    } else if let Some(v) = number.as_u64() {
        v.into()
    } else {
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        match number.as_f64() {
            Some(v) if v.fract() == 0.0 && v.abs() <= EXACT => v as i128,
            Some(v) if v.fract() == 0.0 || v.is_infinite() => {
                return Err(IntegralError::OutOfRange)
            }
            _ => {
                return Err(IntegralError::NotInteger(format!(
                    "{field} must be an integer"
                )))
            }
        }
    };
    T::try_from(wide).map_err(|_| IntegralError::OutOfRange)
}

enum IntegralError {
    /// The number is whole but does not fit: the field's own range rule explains it.
    OutOfRange,
    NotInteger(String),
}

macro_rules! number_value {
    ($(#[$doc:meta])* $name:ident($repr:ty, $field:literal), $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(try_from = "serde_json::Number")]
        pub struct $name($repr);

        impl TryFrom<serde_json::Number> for $name {
            type Error = InvalidValue;

            fn try_from(number: serde_json::Number) -> Result<Self, InvalidValue> {
                match integral::<$repr>(&number, $field) {
                    Ok(value) => $name::try_from(value),
                    // Past the representation's bounds is past the rule's bounds too (both
                    // ends of every rule lie well inside): the rule words the refusal.
                    Err(IntegralError::OutOfRange) => {
                        let beyond = if number.as_f64().is_some_and(|v| v < 0.0) {
                            <$repr>::MIN
                        } else {
                            <$repr>::MAX
                        };
                        $name::try_from(beyond)
                    }
                    Err(IntegralError::NotInteger(message)) => Err(InvalidValue(message)),
                }
            }
        }

        impl $name {
            pub const fn get(self) -> $repr {
                self.0
            }
        }

        impl TryFrom<$repr> for $name {
            type Error = InvalidValue;

            fn try_from(value: $repr) -> Result<Self, InvalidValue> {
                let check: fn($repr) -> Result<(), String> = $check;
                check(value).map_err(InvalidValue)?;
                Ok($name(value))
            }
        }

        impl FromStr for $name {
            type Err = InvalidValue;

            fn from_str(value: &str) -> Result<Self, InvalidValue> {
                let parsed: $repr = value
                    .parse()
                    .map_err(|e| InvalidValue(format!("{value:?} is not a number: {e}")))?;
                $name::try_from(parsed)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.0.serialize(serializer)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value.0
            }
        }
    };
}

string_value!(
    /// A stock-keeping unit: 1 to 64 of `A-Z a-z 0-9 . _ : -`.
    Sku,
    validate::sku
);
string_value!(
    /// A client-chosen reservation id: 1 to 255 bytes, no control characters.
    ReservationId,
    |id| validate::id("reservation_id", id)
);
string_value!(
    /// A client-chosen adjustment id; the rules of [`ReservationId`] under its own field name.
    AdjustmentId,
    |id| validate::id("adjustment_id", id)
);
number_value!(
    /// Units held by one reservation: 1 to 1 000 000.
    Quantity(i64, "quantity"),
    validate::quantity
);
number_value!(
    /// How long a hold lasts: 1 s to one day.
    TtlSeconds(u32, "ttl_seconds"),
    |ttl| validate::ttl_seconds(Some(ttl)).map(|_| ())
);
number_value!(
    /// A stock adjustment: non-zero, at most 1 000 000 000 in magnitude.
    Delta(i64, "delta"),
    validate::delta
);

impl TtlSeconds {
    /// What a request without `ttl_seconds` gets.
    pub const DEFAULT: TtlSeconds = TtlSeconds(TTL_SECONDS_DEFAULT);

    /// The request's ttl, or the default when it has none.
    pub fn or_default(ttl: Option<TtlSeconds>) -> TtlSeconds {
        ttl.unwrap_or(TtlSeconds::DEFAULT)
    }
}

impl Quantity {
    pub const MAX: Quantity = Quantity(QUANTITY_MAX);
}

/// Deserialises an order's lines, naming the line a refused value is on (`lines[3]: sku ...`).
pub(super) fn numbered_lines<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<OrderLine>, D::Error> {
    struct Lines;

    impl<'de> Visitor<'de> for Lines {
        type Value = Vec<OrderLine>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence of order lines")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut lines = Vec::new();
            loop {
                match seq.next_element::<OrderLine>() {
                    Ok(Some(line)) => lines.push(line),
                    Ok(None) => return Ok(lines),
                    Err(error) => {
                        let message = error.to_string();
                        return Err(match rule_violation(&message) {
                            Some(rule) => serde::de::Error::custom(format_args!(
                                "lines[{}]: {rule}",
                                lines.len()
                            )),
                            None => error,
                        });
                    }
                }
            }
        }
    }

    deserializer.deserialize_seq(Lines)
}

#[cfg(test)]
#[path = "values_tests.rs"]
mod tests;
