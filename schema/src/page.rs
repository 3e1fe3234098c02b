//! The keyset page both paged reads take (`GET /v1/events`, `GET /v1/inventory/{sku}/history`):
//! `after` a position, at most `limit` items. One parser, so both routes refuse a bad value
//! with the same words on both services.

/// Most items one page answers.
pub const PAGE_LIMIT_MAX: i64 = 1000;
/// Items one page answers without `limit`.
pub const PAGE_LIMIT_DEFAULT: i64 = 100;

/// The `name=value` pairs of a query string, each name and value percent-decoded once, here
/// for every query either service reads: a parameter means the same however a client encodes
/// it (`partitio%6E=settlement%2Fs1` is `partition=settlement/s1`). The error is the `400`'s
/// detail for a name or value that is not UTF-8 once decoded.
pub fn query_pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    let decode = |raw: &str| {
        percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| format!("{raw:?} is not UTF-8 once percent-decoded"))
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(name)?, decode(value)?))
        })
        .collect()
}

/// Apply one query parameter to `after` or `limit`: `None` when `name` is neither (the route
/// decides), else `Err` with the refusal's detail for a bad value.
pub(crate) fn page_param(
    name: &str,
    value: &str,
    after: &mut i64,
    limit: &mut i64,
) -> Option<Result<(), String>> {
    Some(match name {
        "after" => match value.parse::<i64>() {
            Ok(a) if a >= 0 => {
                *after = a;
                Ok(())
            }
            _ => Err(format!("after must be a position >= 0, got {value:?}")),
        },
        "limit" => match value.parse::<i64>() {
            Ok(l) if (1..=PAGE_LIMIT_MAX).contains(&l) => {
                *limit = l;
                Ok(())
            }
            _ => Err(format!("limit must be 1..{PAGE_LIMIT_MAX}, got {value:?}")),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_names_and_values_are_decoded_once() {
        assert_eq!(
            query_pairs("partitio%6E=settlement%2Fs1&&after=%31&flag").unwrap(),
            vec![
                ("partition".to_owned(), "settlement/s1".to_owned()),
                ("after".to_owned(), "1".to_owned()),
                ("flag".to_owned(), String::new()),
            ]
        );
        // Once: an encoded `%` stays a `%`.
        assert_eq!(query_pairs("a=%2531").unwrap()[0].1, "%31");
        assert!(query_pairs("a=%FF").is_err());
    }
}
