//! The rows of the table, one file each, named as the table names them.

pub mod b1_first_execution;
pub mod b2_replay;
pub mod b3_check_then_act;
pub mod b4_one_key;
pub mod b4_processes;
pub mod b5_stored_records;
pub mod b6_cost_per_call;
pub mod b7_concurrency;
pub mod b8_entity;
pub mod b9_steps;
