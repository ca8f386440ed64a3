# The Django project of test_django.py is imported by Django, not collected: --doctest-modules would
# import every module here, broken_tasks.py (which raises on purpose) and the settings included.
collect_ignore_glob = ["*.py", "*/*.py"]
