"""`python -m qdeploy`: the qdeploy command."""

from qdeploy.cli import main

main()
