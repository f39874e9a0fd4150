"""`python -m qdeploy`: the qdeploy command."""

from qdeploy.pipeline.cli import main

main()
