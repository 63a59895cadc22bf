# The tiny repositories' tests run only inside the SWE-mini sandbox, never in the project's suite.
collect_ignore_glob = ["*"]
