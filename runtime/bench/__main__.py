from runtime.bench.cli import main

main()
