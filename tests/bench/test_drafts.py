"""perf/drafts.py's simulation: a pass takes the draft's agreeing prefix and one token."""

from perf.drafts import simulate


def test_a_pass_takes_the_agreeing_prefix_and_one_token():
    answer = list(range(10, 20))

    def perfect(prompt):
        at = [0]

        def propose(k):
            return answer[at[0] : at[0] + k]

        def accept(tokens):
            at[0] += len(tokens)

        return propose, accept, lambda: None

    def wrong(prompt):
        return (lambda k: [0] * k), (lambda tokens: None), (lambda: None)

    assert simulate(perfect, [([1], answer)], k=4)["tokens_per_pass"] == 10 / 2  # 5 tokens a pass
    assert simulate(wrong, [([1], answer)], k=4)["tokens_per_pass"] == 1.0
