#!/bin/bash
echo tiger > /workspace/hello.txt
