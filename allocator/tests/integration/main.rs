//! The allocator's integration tests, in one binary so that they link once.

mod api;
mod audit;
mod auth;
#[allow(dead_code)]
mod common;
mod config;
mod failover;
mod fencing;
mod hardening;
mod lifecycle;
mod openapi;
mod processes;
mod settlement;
mod tenants;
mod testkit_smoke;
