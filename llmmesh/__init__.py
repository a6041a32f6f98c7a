"""llmmesh: the common package shared by every plane.

It holds only what every plane needs to speak the contract: the generated
protobuf modules (``llmmesh.v1``), the error model, gRPC server plumbing,
typed settings and identifiers. Planes never import one another; they meet
here and on the wire.
"""

__version__ = "0.1.0"
