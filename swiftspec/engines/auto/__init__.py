"""`--mode auto`: a short profile of this machine and model pair (profile.py), cached (store.py),
predicts each engine's speed (model.py); choose.py picks the fastest and says why."""
