"""verl glue in one place: the ``verl_fsdp`` learner (``learner``), its Ray worker groups (``workers``) and the
verl ``AgentLoop`` plug-in (``agent_loop``, with ``agent_loops.yaml``) through which stock verl PPO plays our games.

Nothing here is imported unless asked for: verl, Ray and CUDA are heavy, and the CPU learner never needs them.
"""
