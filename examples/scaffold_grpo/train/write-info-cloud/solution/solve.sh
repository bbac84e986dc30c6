#!/bin/bash
echo cloud > /workspace/info.txt
