"""Speculative decoding with the target in this process: the verification loop, its proposers
(an EAGLE-3 or DFlash drafter, prompt lookup) and greedy or sampled verification.

Shared by train, which measures a checkpoint's acceptance on held-out prompts to keep the best
one, and eval, which measures the finished drafter against the baselines.
"""
