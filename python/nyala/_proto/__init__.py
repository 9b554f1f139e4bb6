"""Generated protobuf and gRPC code for proto/nyala/*.proto. Do not edit: run scripts/gen_proto.sh."""
