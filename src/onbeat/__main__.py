from onbeat.cli import main

main()
