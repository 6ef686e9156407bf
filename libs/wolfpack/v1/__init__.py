"""Generated protobuf and gRPC code for the wolfpack.v1 package (do not edit)."""
