"""eyas: train EAGLE-3 speculative-decoding drafters from a target model's own outputs.

Stages, in order, one module or package each: prompts → generate → tokenize → merge →
extract → train → export → eval. ``records`` is the contract between them, ``config`` the
run file that drives them, ``cli`` the thin command line on top.
"""

__version__ = "0.1.0"
