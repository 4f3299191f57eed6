"""Suite-wide test hygiene, and the two tiers: `python3 -m pytest -q` runs every test (CI),
`python3 -m pytest -q -m "not slow"` the developer's loop (the tests marked slow below left
out; it still imports every module of vtc_jax and sweeps, checked when it finishes)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

# The suite is compile-bound (XLA's compile of a test's program takes 5-10x its run), so
# its programs are built with LLVM's cheap pipeline: about 40% less compile time, slower
# code. Results cannot change: the engine's quantities are integers, and XLA:CPU does not
# reassociate floating point at any level. The CLI subprocesses inherit the flags.
# (VTC_JAX_TEST_FAST_COMPILE=0 tests the default pipeline.)
if os.environ.get("VTC_JAX_TEST_FAST_COMPILE") != "0":
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0",
                                                     "--xla_llvm_disable_expensive_passes=true"]))

# One persistent compilation cache for the whole session, fresh and private to it (never
# the user's): a program compiled once is read back, not compiled again, by a later module
# (after the clear below), by a new jit of the same program, and by the CLI subprocesses,
# which inherit the two variables. Results do not change: the cache holds the executables
# XLA built. Commands given --cache-dir still use theirs (it is set before their first
# compile); --no-cache only leaves the setting as it finds it.
# (VTC_JAX_TEST_CACHE=0 runs without it, to time the difference.)
_SESSION_CACHE = None if os.environ.get("VTC_JAX_TEST_CACHE") == "0" else tempfile.mkdtemp(prefix="vtc_jax_test_xla_")
if _SESSION_CACHE:
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_SESSION_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    jax.config.update("jax_compilation_cache_dir", _SESSION_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_sessionfinish(session, exitstatus):
    if _SESSION_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
    _check_fast_tier_modules(session)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop jax's compiled programs after each test module. One pytest process compiles
    hundreds of programs; on the CPU backend each holds JIT code mappings, and the whole
    suite in one process hit an abort inside XLA's compiler near its end (the programs of
    earlier modules are never reused by later ones, so nothing is lost but memory)."""
    yield
    jax.clear_caches()


@pytest.fixture(scope="module")
def capacity_once_per_mix():
    """capacity.measure, remembered within a module: the measure is deterministic (every
    request at time 0, fcfs, no seeds), so a `compare --server vllm` whose length mix and
    server were measured earlier in the module reuses that capacity (a saturating run of
    hundreds of seats costs a minute or more on 2 cores). The first call of each is the
    real run."""
    from vtc_jax.driver import capacity

    original, seen = capacity.measure, {}

    def measure(prompt, output, settings, server, **kwargs):
        key = (tuple(np.asarray(prompt).tolist()), tuple(np.asarray(output).tolist()), settings, server,
               tuple(sorted(kwargs.items())))
        if key not in seen:
            seen[key] = original(prompt, output, settings, server, **kwargs)
        return seen[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "measure", measure)
        yield


# ---- the tiers ---------------------------------------------------------------------------
#
# Slow tests are named here, in one place, not marked in their files. A pattern is matched
# (fnmatch) against the node id without "tests/": "test_x.py" or "test_x.py::*" is a whole
# file, "test_x.py::test_name*" a test and all its parameters. A test matching a SLOW pattern
# and no KEEP_FAST pattern gets the `slow` mark; every test still runs in the full suite.
# A heavy area keeps at least one cheap test in the fast tier (KEEP_FAST). Seconds are one
# test's time (setup included) on the 2-core VM with two workers while 5 engineers shared it
# (2026-12-07, load average 5-10: up to 5x the quiet machine's figures), except the whole
# files' totals, which are benchmarks/RESULTS.md's per-file figures on the quiet machine.
SLOW: tuple[tuple[str, str], ...] = (
    # whole files: each test compiles and runs engine programs (RESULTS.md, per file, quiet machine)
    ("test_engine_exact.py", "227 s: every policy on 24 random lanes per case, 17 cases"),
    ("test_quiet_steps.py", "179 s: quiet stretches against step by step, 23 cases (80-90 s each here)"),
    ("test_many_clients.py", "166 s: up to 87 clients against the reference"),
    ("test_scale.py", "192 s: fresh processes with 8 forced devices, two processes, caches"),
    ("test_cluster_latency.py", "129 s: cluster CLI and the literal cluster reference"),
    ("test_engine_batching.py", "125 s: batches of 64 lanes, eager runs, wide numbers"),
    ("test_policy_groups.py", "41 s: regrouped against mixed programs"),
    ("test_resources.py", "24 random lanes per case against the reference"),
    ("test_vllm_tiers.py", "the vllm engine at every tier"),
    ("test_bounded_memory.py", "random lanes on two servers and the search"),
    # single tests and families
    ("test_adversary.py::test_committed_witnesses_replay_exactly", "206 s"),
    ("test_adversary.py::test_sweep_cli_*", "15-121 s: the adversary sweep"),
    ("test_adversary.py::test_objective_is_the_engines_and_the_references_backlogged_drift", "60 s"),
    ("test_adversary.py::test_tiny_search_beats_random_and_its_witness_replays", "35 s"),
    ("test_adversary.py::test_blocked_decode_passes_2u_in_engine_and_reference", "25 s"),
    ("test_adversary.py::test_last_left_clause_stops_a_stale_counter", "25 s"),
    ("test_adversary.py::test_search_keeps_a_seeded_elite", "23 s"),
    ("test_adversary.py::test_committed_vtc_witness_passes_2u_while_backlogged_throughout", "7 s"),
    ("test_artifact.py::test_paper_*", "35-42 s: paper sweeps through the driver (bad flags stay)"),
    ("test_artifact.py::test_slots_bound_capacity_only", "34 s"),
    ("test_artifact.py::test_vtc_charges_decode_steps_plus_extra_at_finish", "26 s"),
    ("test_artifact.py::test_measures_against_numpy*", "17-25 s each"),
    ("test_artifact.py::test_rpm_window_boundary_is_inclusive", "20 s"),
    ("test_artifact.py::test_predict_moving_average", "19 s"),
    ("test_artifact.py::test_oracle_*", "14-19 s"),
    ("test_artifact.py::test_clock_near_its_limit_and_refused_past_it", "13 s"),
    ("test_artifact.py::test_engine_matches_reference_*", "10-12 s"),
    ("test_artifact.py::test_cadence_and_stall_timeline", "10 s"),
    ("test_artifact.py::test_never_admitted_is_exactly_the_engines_admission_rule", "7 s"),
    ("test_calibrate_vllm.py::test_written_file_is_the_preset_and_compare_reads_it*", "compare runs on the fit"),
    ("test_cli.py::test_small_trace_json_matches_reference", "17 s"),
    ("test_cli.py::test_module_subprocess*", "3-5 s each: a process per case"),
    ("test_cluster.py::test_random_clusters_match_reference", "209 s: the module's random cluster batch"),
    ("test_cluster.py::test_collapse_and_what_shared_counters_buy", "reads the random cluster batch"),
    ("test_cluster.py::test_replica_choice_rules", "reads the random cluster batch"),
    ("test_cluster.py::test_every_policy_and_limit_on_clusters_*", "every policy on clusters of ideal and slora"),
    ("test_cluster.py::test_sweep_cli", "the cluster sweep"),
    ("test_cluster.py::test_one_router_one_replica_cluster_is_one_server", "cluster against single-server runs"),
    ("test_cluster_cli.py::test_compare_*", "63-97 s"),
    ("test_cluster_cli.py::test_one_router_one_replica_is_the_single_server", "93 s"),
    ("test_cluster_cli.py::test_replay_on_a_cluster", "47 s"),
    ("test_formats_cli.py::test_[amg]*", "replay and compare runs of each format"),
    ("test_hand_cases.py::test_*_fixed_horizon", "the hand cases again at a fixed horizon"),
    ("test_hostile.py::test_hostile_input[[]gen-too-many-requests[]]", "8 s"),
    ("test_itl.py::test_token_times_match_the_reference_on_random_lanes", "random vllm lanes"),
    ("test_itl.py::test_prefix_caching_server_keeps_the_same_record", "a second server's program"),
    ("test_itl.py::test_a_record_too_small_keeps_whole_rows_only", "another record size's program"),
    ("test_itl.py::test_first_scheduling_survives_a_preemption_before_the_first_token", "another program"),
    ("test_kv_blocks.py::test_*_sweep_*", "the kv_blocks sweep, untimed and timed"),
    ("test_kv_blocks.py::test_servegen_rows_are_scaled_to_the_largest_servers_measured_capacity", "capacity runs"),
    ("test_lane_passes.py::test_passes_equal_the_whole_chunk", "runs in passes and whole"),
    ("test_lane_passes.py::test_drained_trace_with_repeated_seeds", "engine runs"),
    ("test_lane_passes.py::test_streams_counted_once_per_distinct_costs", "engine runs"),
    ("test_lane_passes.py::test_sweep_chunks_sized_in_seeds", "a sweep"),
    ("test_measures.py::test_measures_match_numpy_over_reference*", "32 random lanes per case"),
    ("test_native_baseline.py::test_native_equals_sequential_*", "builds and runs the C baseline"),
    ("test_operator.py::test_compare_drains_like_replay", "51 s"),
    ("test_operator.py::test_replay_reports_load_and_overload", "41 s"),
    ("test_operator.py::test_compare_answers_the_weight_question", "37 s"),
    ("test_operator.py::test_compare_log_row_order_is_no_input", "35 s"),
    ("test_operator.py::test_gen_writes_a_trace_with_the_asked_rates", "5 s"),
    ("test_output_safety.py::test_a_signal_while_writing_leaves_nothing_and_is_one_line*", "a process per case"),
    ("test_output_safety.py::test_no_compiled_call_runs_for_long", "long runs by design"),
    ("test_output_safety.py::test_call_sizes_do_not_change_results", "several call sizes"),
    ("test_output_safety.py::test_a_tenants_plot_of_5000_tenants_stays_small", "a 5,000-tenant plot"),
    ("test_output_safety.py::test_a_full_disk_in_a_command_is_one_line_and_exit_2", "a whole command run"),
    ("test_over_clients.py::test_integer_reductions_equal_numpy*", "a compile per width"),
    ("test_policies.py::test_user_policy_*", "two processes; 48 lanes against the reference"),
    ("test_policies.py::test_gateway_vtc_forgets_only_after_gc_steps", "engine runs"),
    ("test_wide_clock.py::test_a_shifted_trace_runs_the_same_schedule_shifted*", "160 lanes, narrow and wide"),
    ("test_wide_clock.py::test_a_log_past_the_int32_clock_runs_in_one_pass", "two compare runs"),
    ("test_fleet_shedding.py::test_latency_over_seeds_behind_a_gateway", "two fleet compares of 3 seeds"),
    ("test_policy_modules.py::test_a_renamed_builtin_passes_the_checks*", "6-14 s each: check_policy"),
    ("test_policy_modules.py::test_a_policy_cannot_bypass_the_limits*", "13-20 s each"),
    ("test_policy_modules.py::test_a_replica_admits_only_a_backlogged_tenant", "30 s"),
    ("test_policy_modules.py::test_an_impossible_choice_admits_nothing_and_every_step_ends", "19 s"),
    ("test_policy_modules.py::test_a_module_enabling_x64_is_refused_and_jax_is_restored", "15 s"),
    ("test_policy_modules.py::test_sys_exit_at_import_does_not_end_the_command", "10 s: a process"),
    ("test_policy_modules.py::test_the_example_policy_passes_the_checks", "8 s"),
    ("test_policy_sources.py::test_fair_queueing_*", "hand cases (las and drr stay)"),
    ("test_registries.py::test_every_policy_drains_and_conserves_on_every_server*", "every policy on each server"),
    ("test_reliability.py::test_extreme_settings_run_exactly*", "engine runs at the limits"),
    ("test_reliability.py::test_long_run_prefix_equals_short_run", "a long run"),
    ("test_reliability.py::test_fuzzed_cli_flags_*", "60 replays"),
    ("test_reliability.py::test_fuzzed_sweep_flags_*", "40 sweeps"),
    ("test_reliability.py::test_million_row_trace", "a million rows"),
    ("test_reliability.py::test_billion_step_sparse_replay_jumps_its_idle_steps", "a long horizon"),
    ("test_runner_tail.py::test_tail_calls_stop_near_the_slowest_lane_and_change_nothing*", "engine runs"),
    ("test_sequential.py::test_matches_engine_*", "engine runs (the reference case stays)"),
    ("test_servegen.py::test_generated_layout_and_determinism", "132 s"),
    ("test_servegen.py::test_interarrival_cv", "64 s"),
    ("test_servers.py::test_a_users_server_runs_in_the_engine_unchanged", "a user's server compiled"),
    ("test_slora.py::test_slora_matches_the_artifact_reference_on_random_lanes*", "random slora lanes"),
    ("test_slora.py::test_every_policy_*", "every policy on slora"),
    ("test_slora.py::test_idle_poll_and_jump", "another program"),
    ("test_slora_compare.py::test_request_table_equals_the_literal_reference", "the module's random runs"),
    ("test_slora_compare.py::test_token_times_equal_the_literal_reference", "the module's random runs"),
    ("test_slora_compare.py::test_the_600_s_log_*", "a 600 s log on slora"),
    ("test_slora_compare.py::test_per_tenant_waits_name_their_unit", "a compare run"),
    ("test_sweep_servers.py::test_a_sweep_runs_on_vllm_with_its_pool_as_m", "three sweeps"),
    ("test_sweep_servers.py::test_default_server_is_unchanged", "sweeps twice"),
    ("test_sweeps.py::test_schedulers_fcfs_grows_vtc_bounded", "two sweeps"),
    ("test_sweeps.py::test_return_after_silence_shares", "a sweep"),
    ("test_sweeps.py::test_kv_budget_drift_rises_and_stays_bounded", "a sweep"),
    ("test_sweeps.py::test_rpm_throughput_rises_with_the_limit", "a sweep"),
    ("test_sweeps.py::test_chunking_does_not_change_results", "a sweep twice"),
    ("test_sweeps.py::test_tenants_on_vllm_loads_are_against_measured_capacity", "capacity runs"),
    ("test_testing.py::test_example_policy_passes", "check_policy"),
    ("test_testing.py::test_a_policy_that_disagrees_with_its_reference_fails", "check_policy"),
    ("test_timed.py::test_load_line_is_against_measured_capacity*", "capacity runs"),
    ("test_timed.py::test_saturated_rate_by_hand", "a saturating run"),
    ("test_timed.py::test_capacity_of_one_seat_is_one_request_per_period", "a capacity run"),
    ("test_timed.py::test_itl_mean_pools_every_gap", "a compare run"),
    ("test_timed.py::test_mooncake_hash_ids_share_blocks_by_hand", "a compare run"),
    ("test_timed.py::test_a_users_step_time_file", "a compare run"),
    ("test_timed.py::test_two_requests_share_a_step_and_goodput", "a compare run"),
    ("test_traffic.py::test_simulated_traffic_runs_and_is_reproducible", "engine runs"),
    ("test_traffic.py::test_confidence_interval_covers_the_mean_about_95_percent", "many seeds"),
    ("test_traffic.py::test_lanes_draw_the_single_lane_generator_rows*", "generators per lane"),
    ("test_traffic.py::test_same_seed_same_trace_whatever_the_batch", "generators per batch"),
    ("test_truth_cli.py::test_light_log_*", "a compare run"),
    ("test_truth_cli.py::test_a_burst_that_queues_is_still_overloaded", "a compare run"),
    ("test_truth_cli.py::test_replay_prints_2u_and_the_guarantee_ratio", "a replay"),
    ("test_truth_cli.py::test_compare_*", "compare runs"),
    ("test_truth_cli.py::test_drift_over_2u_is_not_reported_with_unequal_weights", "a compare run"),
    ("test_truth_cli.py::test_tenant_wait_panel_draws_zero_waits", "a compare run and plots"),
    ("test_truth_sweeps.py::test_paper_service_rate_figure_stays_bounded[[]24-*", "16 s"),
    ("test_truth_sweeps.py::test_paper_service_rate_figure_stays_bounded[[]195-*", "49 s"),
    ("test_tuning.py::test_beta_tune_*", "a sweep (the ES tuner itself stays)"),
    ("test_tuning.py::test_context_cost_*", "a sweep"),
    ("test_tuning.py::test_prefix_cache_*", "a sweep"),
    ("test_tuning.py::test_kv_cap_*", "a sweep"),
    ("test_vllm_cli.py::test_cli_reproduces_the_real_scheduler*", "19-71 s each: a golden through the CLI"),
    ("test_vllm_cli.py::test_enable_prefix_caching_picks_the_server*", "15 s"),
    ("test_sglang_cli.py::test_cli_reproduces_sglang_scheduler*", "21-33 s each: an SGLang golden through the CLI"),
    ("test_sglang_cli.py::test_tie_rule_reports_file_rows", "23 s: a CLI run (s1007, kept fast, shows the rule too)"),
    ("test_vllm_prefix.py::test_random_lanes_match_the_reference", "random lanes"),
    ("test_vllm_prefix.py::test_the_smallest_lru_ring_*", "15 s: 40 random lanes"),
    ("test_vllm_prefix.py::test_the_closed_form_running_phase_is_the_walk", "60 s: 100 lanes, fast path per lane"),
    ("test_fleet.py::test_one_vllm_replica_is_one_vllm_server", "cluster and engine runs"),
    ("test_fleet.py::test_round_robin_fleet_is_*", "cluster and engine runs"),
    ("test_fleet.py::test_one_replica_behind_*", "cluster and engine runs"),
    ("test_fleet.py::test_llmd_prefix_affinity_*", "150 s: vllm_prefix fleets"),
    ("test_fleet.py::test_sweeps_fleet_writes_its_table", "a compare study"),
    ("test_vllm_async.py::test_server_reproduces_the_async_golden*", "56 s: the async goldens' batches"),
    ("test_vllm_async.py::test_random_lanes_match_the_reference", "random lanes"),
    ("test_vllm_async.py::test_every_policy_drains_async_lanes_*", "16 s"),
    ("test_vllm_async.py::test_prefix_server_reproduces_the_async_golden*", "40-56 s: the 17 async prefix goldens' batch"),
    ("test_vllm_async.py::test_random_prefix_lanes_match_the_reference", "30-41 s: 180 random prefix lanes"),
    ("test_prefix_charging.py::test_hit_rates_per_tenant_by_hand", "a timed compare: 40 s"),
    ("test_prefix_charging.py::test_a_pool_that_never_evicts_*", "a timed compare: 38 s"),
    ("test_study.py::test_a_load_line_that_cannot_be_measured_*", "a timed compare: 47 s"),
    ("test_vllm_prefix.py::test_slots_are_the_seats_and_lanes_of_one_batch_share_a_size", "engine runs"),
    ("test_vllm_prefix.py::test_a_prefix_len_without_an_id_is_shared_within_its_client", "engine runs"),
    ("test_vllm_server.py::test_golden_step_for_step*", "the goldens' batches: 224 s (one golden stays, through the CLI)"),
    ("test_vllm_server.py::test_random_lanes_match_the_reference", "53 s"),
    ("test_vllm_server.py::test_block_sizes_not_powers_of_two_match_the_reference", "37 s"),
    ("test_vllm_server.py::test_hand_worked_priority_victim_preempts_itself_and_the_walk_goes_on", "35 s"),
    ("test_vllm_server.py::test_the_victim_defaults_to_vllms_for_the_policy", "8 s"),
    ("test_workload_stats.py::test_compiled_stats_equal_op_by_op_and_literal_counts", "a compile per shape"),
    # measured in the fast tier's first cut (same machine and load)
    ("test_truth_round3_inputs.py::test_requests_out_row_is_the_files_row_after_window_and_failures", "162 s"),
    ("test_guide.py::test_fast_blocks_match_the_cli", "108 s: the guide's commands"),
    ("test_servegen.py::test_unbiased_*", "66 s: the full-span fixture"),
    ("test_servegen.py::test_offered_load_and_lengths", "the full-span fixture"),
    ("test_servegen.py::test_busy_rows_layout_and_load", "40 s: the busy-rows fixture"),
    ("test_timed.py::test_one_request_worked_by_hand", "59 s: the timed compare's first compile"),
    ("test_requeue.py", "54 s, then 33 s for the next seed alone: a compile per seed (re-queueing stays in the fast tier "
     "through test_itl's hand-worked preemption)"),
    ("test_study.py::test_results_json_has_one_schema_on_every_server", "42 s"),
    ("test_study.py::test_requests_out_into_an_out_directory_not_made_yet", "17 s"),
    ("test_study.py::test_a_cut_horizon_flags_and_counts_unfinished_requests", "17 s"),
    ("test_study.py::test_priority_column_orders_a_timed_vllm_run", "16 s"),
    ("test_study.py::test_seeds_give_every_timed_figure_a_ci", "13 s"),
    ("test_truth_round3_cli.py::test_replay_writes_json_to_stdout_and_dev_null", "42 s"),
    ("test_truth_round3_cli.py::test_adversary_takes_num_gpu_blocks", "25 s"),
    ("test_truth_round3_cli.py::test_ctrl_c_in_a_policy_modules_import_is_one_line_and_130[[]in_process[]]",
     "18 s (the command's case stays)"),
    ("test_hostile.py::test_closed_pipe_is_one_line_not_a_traceback", "41 s: a process (Ctrl-C's stays)"),
    ("test_operator.py::test_compare_prompt_over_m_is_dropped_and_counted", "30 s"),
    ("test_artifact.py::test_idle_poll_and_stall_of_running_batch", "18 s alone"),
    ("test_timeline.py::test_block_of_rows_is_a_binary_search_of_the_block_starts", "27 s"),
    ("test_request_log.py::test_servegen_directory", "24 s"),
    ("test_policy_sources.py::test_drr_cursor_moves_on_as_dynamo_code_does", "16 s (las's cases stay)"),
    ("test_truth_inputs.py::test_redraws_past_the_trace_all_arrive_and_complete", "17 s"),
    ("test_traffic.py::test_phases_silence_ramp_and_on_off", "16 s"),
    ("test_policies.py::test_drr_hand_worked", "15 s"),
    ("test_hand_cases.py::test_head_of_line_stop*", "4-6 s each (lift stays)"),
    ("test_hand_cases.py::test_last_left_clause", "6-10 s"),
    ("test_slora_compare.py::test_hand_worked_ttft_tpot", "18 s (test_slora's hand-worked timeline stays)"),
    ("test_study.py::test_replay_on_slora_takes_its_own_memory", "15 s"),
    ("test_study.py::test_a_timed_replay_honours_priority_and_writes_requests", "68 s"),
    ("test_hand_cases.py::test_counter_tie_*", "3-6 s each"),
    ("test_hand_cases.py::test_rpm_window_boundary", "5 s"),
    ("test_hand_cases.py::test_cached_prefix", "8 s"),
    ("test_hand_cases.py::test_fractional_beta_and_weights", "4 s"),
    ("test_blis_physics.py", "BLIS's goldens and random traces: a replay compile each, 20-40 s"),
    ("test_gpu_time.py::test_gpu_share_in_the_timed_report_whatever_the_cost", "two timed compares, 25 s"),
    ("test_gpu_time_sweep.py::test_a_tiny_run_writes_a_consistent_set", "three compares over two seeds, 58 s cold"),
)

# Tests kept in the fast tier although a SLOW pattern names them: one cheap case per heavy area.
KEEP_FAST: tuple[tuple[str, str], ...] = (
    ("test_blis_physics.py::test_the_physics_step_worked_by_hand", "the physics step by hand, no run"),
    ("test_blis_physics.py::test_blis_golden_runs_to_the_microsecond[[]blis_ties[]]", "one BLIS golden run (20 s)"),
    ("test_engine_exact.py::test_matches_reference_every_step[[]drain-2[]]", "engine exactness: every policy, 2 clients"),
    ("test_vllm_cli.py::test_cli_reproduces_the_real_scheduler[[]g004[]]", "a vLLM golden replayed exactly (19 s)"),
    ("test_sglang_cli.py::test_cli_reproduces_sglang_scheduler[[]s1007[]]",
     "an SGLang golden replayed exactly: the tie rule and a retraction (24-33 s)"),
    ("test_artifact.py::test_engine_matches_reference[[]0[]]", "the artifact engine against its reference (7 s)"),
    ("test_quiet_steps.py::test_ideal_quiet_steps_hand_worked", "quiet stretches, hand-worked"),
    ("test_many_clients.py::test_servegen_slice_is_many_real_tenants", "the many-tenant slice"),
    ("test_cluster_latency.py::test_bad_flags_on_a_cluster_are_one_line*", "the cluster CLI's bad input"),
    ("test_engine_batching.py::test_refuses_a_charge_past_the_exact_limit", "the exact limit"),
    ("test_policy_groups.py::test_rule", "the regrouping rule"),
    ("test_policy_groups.py::test_decide_counts_what_mixing_paid", "the regrouping decision"),
    ("test_policy_groups.py::test_device_plan", "the device plan"),
    ("test_policy_groups.py::test_merge_puts_lanes_back_in_order", "the merge"),
    ("test_bounded_memory.py::test_ideal_reserve_is_registered_after_vllm", "the bounded server's registry"),
)

# Patterns that named no collected test in the last full collection (a renamed or removed
# test leaves its pattern stale): tests/test_tiers.py fails on them.
UNMATCHED: list[str] = []
FULL_COLLECTION: list[bool] = [False]


def _short_id(nodeid: str) -> str:
    return nodeid[len("tests/"):] if nodeid.startswith("tests/") else nodeid


def _matches(short: str, pattern: str) -> bool:
    if "::" not in pattern:
        pattern += "::*"
    return fnmatch.fnmatchcase(short, pattern)


def tier_of(nodeid: str) -> str:
    """"slow" or "fast" for a node id such as "tests/test_x.py::test_y[3]"."""
    short = _short_id(nodeid)
    slow = any(_matches(short, p) for p, _ in SLOW) and not any(_matches(short, p) for p, _ in KEEP_FAST)
    return "slow" if slow else "fast"


def _is_whole_collection(config) -> bool:
    """The session collected the configured test paths (given or not: an xdist worker is
    given them) with no -k, --deselect or --lf."""
    paths = lambda names: {(config.rootpath / name).resolve() for name in names}
    return (paths(config.args) == paths(config.getini("testpaths")) and not config.option.keyword
            and not config.getoption("deselect", None) and not config.getoption("lf", False))


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if tier_of(item.nodeid) == "slow":
            item.add_marker(pytest.mark.slow)
    if _is_whole_collection(config):
        shorts = [_short_id(item.nodeid) for item in items]
        FULL_COLLECTION[0] = True
        UNMATCHED[:] = [p for p, _ in SLOW + KEEP_FAST if not any(_matches(s, p) for s in shorts)]


# ---- the fast tier touches every module ----------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
# Run only as a process (`python -m vtc_jax`): importing it runs the CLI.
# tests/test_tiers.py runs it in the fast tier.
RUN_AS_PROCESS = frozenset({"vtc_jax.__main__"})
_WORKER_MODULES: set[str] = set()


def package_modules() -> set[str]:
    """Dotted names of every module of vtc_jax (all floors) and sweeps, from the files."""
    names = set()
    for top in ("vtc_jax", "sweeps"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _imported() -> set[str]:
    return {name for name in sys.modules if name.split(".")[0] in ("vtc_jax", "sweeps")}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist: each worker reports the package modules its tests imported."""
    _WORKER_MODULES.update(getattr(node, "workeroutput", {}).get("vtc_jax_modules", ()))


def _check_fast_tier_modules(session) -> None:
    """After a whole `-m "not slow"` run (every test ran, passed or failed): every module of
    vtc_jax and sweeps was imported by some test, or the session fails naming those that were
    not."""
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: hand its imports to the controller
        config.workeroutput["vtc_jax_modules"] = sorted(_imported())
        return
    if (config.option.markexpr != "not slow" or not _is_whole_collection(config) or config.option.maxfail
            or session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)):
        return  # not the whole fast tier, or not every test of it ran
    missing = sorted(package_modules() - _imported() - _WORKER_MODULES - RUN_AS_PROCESS)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if missing:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter:
            reporter.write_line(f"fast tier: {len(missing)} modules imported by no test: {', '.join(missing)}", red=True)
    elif reporter:
        reporter.write_line(f"fast tier: every one of the {len(package_modules())} modules of vtc_jax and sweeps imported")
