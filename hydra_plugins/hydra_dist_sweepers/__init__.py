"""hydra-dist's Hydra plugins. Hydra finds plugins only inside the `hydra_plugins` namespace package, and imports
every module here at the start of each command, so these modules import nothing slow at the top."""
