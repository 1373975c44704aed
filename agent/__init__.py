"""The nodecheck command line and, later, the long-running agent."""
