"""Test support shared by every test package: layer harnesses, a scripted inner service, async
helpers. Area-specific helpers stay in each package's ``support.py`` and import from here."""
