"""Replay AgentDojo tool-call traces through a real ``warden serve``.

Modules: ``corpus`` (reading the suites, turning printed results back into
JSON), ``plan`` (the plan a task's benign trace implies), ``score``
(effectful tools, outcomes, the per-suite summary), ``server`` (starting and
stopping the server), ``run`` (the command line and the replay loop).
"""
