"""The harness: fake model servers, load generator, replay benchmark, closed loop against a real control plane.

Importing the package caps the BLAS threads of this process, and of the processes it starts, to one unless a
thread count is set in the environment (`autoscaler.blas`): every `python -m loadtest.X` imports the package
before numpy, so the replays' statsmodels fits and the frontier's forked workers run single-threaded BLAS
(the fits are tiny; on 2 cores the extra threads spin and two workers oversubscribe the cores).
"""

from autoscaler.blas import cap_this_process

cap_this_process()
