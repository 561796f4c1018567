"""bench/bench_kernel_cost.py: its extra kernel calls really run, on the critical path, and its per-call arithmetic.
The benchmark itself (minutes of training steps) is not run here."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_kernel_cost  # noqa: E402


def test_each_call_runs_its_extra_calls_before_it():
    """A Repeated kernel runs `extra` more times before each of its calls when only its result is fetched: a chain
    of calls, each on the last one's output, the real call on the chain's end (a kernel that doubles its input and
    counts its calls stands in for the XLA one). Bugs caught: the chain's calls run on the input itself (grappler
    merges calls on the same input into one) or tied to the real call by a control dependency only (grappler
    makes NoOps of stateless calls that only a control edge reads: the step timed none of them)."""
    import tensorflow.compat.v1 as tf

    graph = tf.Graph()
    with graph.as_default():
        counter = tf.Variable(0, dtype=tf.int32)

        @tf.function(autograph=False)
        def counted(x):
            with tf.control_dependencies([counter.assign_add(1)]):
                return tf.identity(2.0 * x)
        repeated = bench_kernel_cost.Repeated(counted, extra=3)
        out = repeated(tf.constant([1.0, 2.0]))
        initialise = tf.global_variables_initializer()
    with tf.Session(graph=graph) as session:
        session.run(initialise)
        assert list(session.run(out)) == [16.0, 32.0]  # four doublings: the real call on the chain's end
        assert session.run(counter) == 4
    assert repeated.calls == 1


def test_the_cost_per_call_is_the_fastest_steps_growth_per_extra_call():
    """(fastest step with extra calls - fastest plain step) / (extra x calls a step), in ms: a step's spikes (other
    work on the machine) move neither side. Bug caught: dividing by the extra count alone (13x too dear here)."""
    plain = [{"step_times": [0.95, 0.90]}, {"step_times": [0.93, 1.10]}]
    extra = [{"step_times": [0.955, 0.926], "extra": 8, "calls_per_step": 13},
             {"step_times": [1.20, 0.927], "extra": 8, "calls_per_step": 13}]
    assert bench_kernel_cost.per_call_ms(plain, extra) == pytest.approx(26.0 / 104)


def test_the_command_line_takes_bench_trains_shapes():
    args = bench_kernel_cost.parse(["--kernel", "gelu", "--shape", "neo", "--precision", "float32"])
    assert (args.kernel, args.n_ctx, args.batch, args.n_embd, args.precision) == ("gelu", 2048, 1, 512, "float32")
    assert bench_kernel_cost.KERNELS["gelu"][1] == 4  # GELU runs on the 4 x n_embd hidden layer


def test_a_kernel_the_step_never_calls_is_an_error_not_a_division_by_zero(monkeypatch):
    """bf16 MLPs add c_fc's bias inside GELU's kernel (`bias_gelu`), so `--kernel gelu` at bf16 finds no call to
    chain: one error line naming the kernel to pick, not a ZeroDivisionError after minutes of steps."""
    runs = []
    monkeypatch.setattr(bench_kernel_cost, "run_worker", lambda kind, args, extra=0, threads=0: runs.append(extra) or
                        {"step_times": [0.9], "extra": extra, "calls_per_step": 0})
    args = bench_kernel_cost.parse(["--kernel", "gelu", "--repeats", "1"])
    with pytest.raises(SystemExit, match="^error: the bfloat16 step never calls _gelu_forward: .*bias_gelu"):
        bench_kernel_cost.measure(args)
    assert runs == [0]  # after the first (plain) run, which counts the calls too
