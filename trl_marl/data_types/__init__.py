"""Data types: what flows between the services and the trainers.

The rollout tree and its samples (`rollout`), prompt and completion text (`text`), batches laid out for one forward
pass (`batches`), the critic data of actor-critic trainers (`critic`) and the random streams saved with every
checkpoint (`rng`). This layer imports only `trl_marl.algorithms` (and torch / numpy): no models, no I/O, no trainers.
"""
