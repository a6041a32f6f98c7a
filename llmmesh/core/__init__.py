"""What every plane uses to speak the contract and run as a process: the
error model, gRPC server and client plumbing, typed settings, identifiers,
identities and mTLS, the SQL store, tracing and logs.

It imports only the generated contract (``llmmesh.v1``) and never a plane or
a tool."""
