//! The router's integration tests, in one binary so that they link once.

mod api;
#[allow(dead_code)]
mod common;
mod failover;
mod give_up;
mod openapi;
mod order_races;
mod orders;
mod routing;
