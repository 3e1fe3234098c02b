//! The router's integration tests, in one binary so that they link once.

mod api;
mod auth;
#[allow(dead_code)]
mod common;
mod failover;
mod give_up;
mod handoff;
mod hostile_input;
mod openapi;
mod order_races;
mod orders;
mod prometheus;
mod request_id;
mod routing;
mod tenants;
mod tls;
mod ui;
