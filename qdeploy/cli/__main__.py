"""`python -m qdeploy.cli`: the qdeploy command (as `python -m qdeploy`)."""

from qdeploy.cli import main

main()
