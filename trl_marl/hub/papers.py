"""The paper each trainer's method comes from, cited in the team's model cards (TRL's card template)."""

from __future__ import annotations

_CoMLRL = {
    "title": "LLM Collaboration With Multi-Agent Reinforcement Learning",
    "id": "2508.04652",
    "citation": (
        "@article{liu2025llmcollab,\n  title={LLM Collaboration With Multi-Agent Reinforcement Learning},\n"
        "  author={Liu, Shuo and Liang, Zeyu and Lyu, Xueguang and Amato, Christopher},\n"
        "  journal={arXiv preprint arXiv:2508.04652},\n  year={2025}\n}"
    ),
}
# Central-V (one centralized critic) and IAC (independent actor-critic) are defined and compared in COMA's paper.
_COMA = {
    "title": "Counterfactual Multi-Agent Policy Gradients",
    "id": "1705.08926",
    "citation": (
        "@inproceedings{foerster2018coma,\n  title={Counterfactual Multi-Agent Policy Gradients},\n"
        "  author={Foerster, Jakob and Farquhar, Gregory and Afouras, Triantafyllos and Nardelli, Nantas and "
        "Whiteson, Shimon},\n  booktitle={AAAI Conference on Artificial Intelligence},\n  year={2018}\n}"
    ),
}
_MAPPO = {
    "title": "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games",
    "id": "2103.01955",
    "citation": (
        "@inproceedings{yu2022mappo,\n  title={The Surprising Effectiveness of PPO in Cooperative Multi-Agent "
        "Games},\n  author={Yu, Chao and Velu, Akash and Vinitsky, Eugene and Gao, Jiaxuan and Wang, Yu and "
        "Bayen, Alexandre and Wu, Yi},\n  booktitle={NeurIPS Datasets and Benchmarks},\n  year={2022}\n}"
    ),
}
_DPO = {
    "title": "Direct Preference Optimization: Your Language Model is Secretly a Reward Model",
    "id": "2305.18290",
    "citation": (
        "@inproceedings{rafailov2023dpo,\n  title={Direct Preference Optimization: Your Language Model is Secretly a "
        "Reward Model},\n  author={Rafailov, Rafael and Sharma, Archit and Mitchell, Eric and Ermon, Stefano and "
        "Manning, Christopher D. and Finn, Chelsea},\n  booktitle={Advances in Neural Information Processing "
        "Systems},\n  year={2023}\n}"
    ),
}
_MARLHF = {
    "title": "Multi-Agent Reinforcement Learning from Human Feedback: Data Coverage and Algorithmic Techniques",
    "id": "2409.00717",
    "citation": (
        "@article{zhang2024marlhf,\n  title={Multi-Agent Reinforcement Learning from Human Feedback: Data Coverage "
        "and Algorithmic Techniques},\n  author={Zhang, Natalia and Wang, Xinqi and Cui, Qiwen and Zhou, Runlong and "
        "Kakade, Sham M. and Du, Simon S.},\n  journal={arXiv preprint arXiv:2409.00717},\n  year={2024}\n}"
    ),
}

# Keyed by the trainers' `_name` (the `algorithm` of `team.json`); a trainer's own `_paper` takes precedence.
PAPERS: dict[str, dict[str, str]] = {
    "MAGRPO": _CoMLRL,
    "MAREINFORCE": _CoMLRL,
    "MARLOO": _CoMLRL,
    "MAReMax": _CoMLRL,
    "CentralizedMAGRPO": _CoMLRL,
    "MAAC": _COMA,
    "IAC": _COMA,
    "MAPPO": _MAPPO,
    "MADPO": _DPO,
    "MADPOIter": _DPO,
    "MARLHF": _MARLHF,
    "MARLHFIter": _MARLHF,
}


def paper_of(algorithm: str | None) -> dict[str, str] | None:
    """The paper (`title`, arXiv `id`, BibTeX `citation`) of a trainer's method, by its algorithm name."""
    return PAPERS.get(str(algorithm)) if algorithm else None
