"""`python -m qdeploy.pipeline.cli`: the qdeploy command (as `python -m qdeploy`)."""

from qdeploy.pipeline.cli import main

main()
