from perf.workload import WorkloadSpec, generate, load, save


def test_same_seed_same_traffic(tmp_path):
    spec = WorkloadSpec(sessions=40, seed=3)
    a, b = generate(spec), generate(spec)
    assert [s.__dict__ for s in a] == [s.__dict__ for s in b]
    path = save(a, spec, tmp_path / "w.jsonl")
    spec2, back = load(path)
    assert spec2 == spec and [s.__dict__ for s in back] == [s.__dict__ for s in a]
    assert generate(WorkloadSpec(sessions=40, seed=4))[0].turns != a[0].turns


def test_shape_of_the_traffic():
    spec = WorkloadSpec(sessions=300, rate_per_s=2.0, burst_every_s=20, burst_length_s=5, burst_factor=5)
    sessions = generate(spec)
    assert all(3 <= len(s.turns) <= 6 for s in sessions)
    assert 0.05 < sum(s.priority == 1 for s in sessions) / len(sessions) < 0.3
    lengths = sorted(len(s.turns[0]) for s in sessions)
    assert lengths[0] < 40 and lengths[-1] > 300  # from short questions to pasted context
    times = [s.arrival_s for s in sessions]
    assert times == sorted(times)
    in_burst = sum((t % 20) >= 15 for t in times) / len(times)
    # bursts are 25% of the time at 5x the rate: ~62% of arrivals
    assert 0.45 < in_burst < 0.8
