"""Layer 7, runtime: workers, their hosting inside a process, worker groups and a throwaway local cluster.
Imports the layers below."""
