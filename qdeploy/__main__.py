"""`python -m qdeploy`: the qdeploy command."""

from qdeploy.cli import main

if __name__ == "__main__":  # a spawned child process imports this module too; it must not run the command
    main()
