"""The study scripts, one per study (see fpsim/studies.py); installed as fpsim.study_scripts."""
