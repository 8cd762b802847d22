from onbeat.cli import main

main(prog_name="onbeat")
