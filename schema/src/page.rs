//! The keyset page both paged reads take (`GET /v1/events`, `GET /v1/inventory/{sku}/history`):
//! `after` a position, at most `limit` items. One parser, so both routes refuse a bad value
//! with the same words on both services.

/// Most items one page answers.
pub const PAGE_LIMIT_MAX: i64 = 1000;
/// Items one page answers without `limit`.
pub const PAGE_LIMIT_DEFAULT: i64 = 100;

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
