"""Messages compiled from ``FlightSql.proto`` (Apache Arrow) with grpcio-tools: ``python -m grpc_tools.protoc -I. --python_out=. FlightSql.proto``. Generated code: do not edit."""
