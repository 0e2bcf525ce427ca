"""How well an exported chat model answers, greedy, through the engine chat serves with.

- ``answers``: FAQ answers to training questions and to held-out paraphrases (the export's
  accuracy gate reads it; ``python -m switchboard.evaluation.answers``);
- ``tools``: the right tool and arguments on held-out questions, with ``tool_choice`` auto and
  required (``python -m switchboard.evaluation.tools``);
- ``agent``: exported models side by side on FAQ, tools and JSON extraction (``python -m
  switchboard.evaluation.agent``).

Apart from the trainers: it judges exported artifacts whatever made them, and export and the
benchmarks import it.
"""
