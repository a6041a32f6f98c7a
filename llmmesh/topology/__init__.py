"""How a mesh is laid out for the tools that start and front it: the mesh
configuration file, network namespaces, the certificate directory and the
Envoy front proxy's configuration. No plane imports it."""
